"""Machine providers: MAAS and Ironic behind one Protocol, for whole-node baremetal leases (issue 30).

`protocols` holds the contract and its values, `ironic` and `maas` the two
implementations (plain HTTP), `registry` builds them from the Fleet's
`machine_providers` with credentials read at run time, `probes` the SSH
readiness check. `lab/` starts a standalone Ironic and serves the MAAS
simulator for tests, the demo and benches; product code never imports it.
"""
