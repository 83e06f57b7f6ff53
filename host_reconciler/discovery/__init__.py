"""Host topology discovery and the approval gate.

Discovery proposes, git approves (seed 000: "slice inventory is a
host-approved topology map, not a blind GPU count"):

- `discovering.discover(root) -> facts.Discovery` reads GPUs, RDMA fabric
  devices and their SR-IOV VFs, NVMe namespaces, NUMA nodes, hugepages and
  host prerequisites from a sysfs root (`/`, or a recorded tree under
  `examples/sysfs/`), read-only, through one code path (`sysfs.SysRoot`).
- `candidates.candidate_map(discovery, node=...) -> Candidate` pairs each GPU
  with a NUMA-local VF and disk into a candidate SlotMap with
  `approval_required: true` and per-slot blockers (`blockers` codes). Pure.
- `proposals.node_document(candidate, discovery)` and `proposals.summary`
  give the Node document proposed beside the candidate and the count of ready
  and blocked slots. Pure.
- `gating.gate(approved, discovery) -> GateResult` decides per slot: the
  eligibility `gpuaas validate` applies (`policies.eligibility`), then
  `gating.compare`, which the host reconciler runs on every pass: a slot whose
  GPU, VF, disk identity or NUMA node changed is blocked with its drift; the
  other slots stay in service. Pure.

`cli` adds `gpuaas host discover` and `gpuaas host gate`; `bench` adds
`gpuaas bench discover`.
"""
