"""Provider labs: a standalone Ironic process and the MAAS simulator, for tests, the demo and benches."""
