"""What runs in the MCP virtualenv alone: the SDK's server (server.py) and the process around it
(serve.py). The only modules of sealgate that import the `mcp` SDK (tests/unit/
test_import_graph.py)."""
