"""The clients a harness drives sandboxd with, over its API only: client.py (sync, standard library
only), aclient.py (asyncio), what they share (clientshared.py) and `sealgate sandbox` sessions
(sessioncli.py). `sealgate.sandbox` re-exports the public names."""
