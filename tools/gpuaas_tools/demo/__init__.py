"""`gpuaas demo`: the claims, GitOps, bare-metal and host stories told on an example fleet.

`command.py` registers `gpuaas demo` (the `demo` entry point); `example-fleet`
is the fleet it runs on when no examples/ is at hand (a link to
examples/fleet in a checkout, the files themselves in a wheel).
"""
