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
- `gating.gate(approved, discovery) -> GateResult` compares an approved
  SlotMap with discovery on every host-reconciler pass: a slot whose GPU, VF,
  disk identity or NUMA node changed is blocked with its drift; the other
  slots stay in service. Pure.

`cli` adds `gpuaas host discover` and `gpuaas host gate`; `bench` adds
`gpuaas bench discover`.
"""
