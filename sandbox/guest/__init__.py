"""What runs *inside* a sandbox, and the wire it speaks (`protocol`).

Standard library only, importing nothing of sealgate's (tests/unit/test_import_graph.py holds
it so): these modules are handed to the host's python3 in the sandbox (`staging`), where no
sealgate is installed. The agent of bubblewrap and gVisor (`agent`, with `confine`,
`commands`, `files`, `shim`), the self-test's probe (`probe`), and the microVM's guest agent
(`vmagent`, `vmos`, its `/init` in `init.sh`).

Kept empty of code: the microVM's guest imports this package at every boot.
"""
