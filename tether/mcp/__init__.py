"""Remote MCP servers, as the hosted `mcp` tool of the Responses API (docs/mcp.md).

`policy` decides which servers a create may name and which addresses Tether connects to;
`client` is one initialised session with one server (the `mcp` SDK, streamable HTTP, or
HTTP+SSE for a server that only speaks that); `sessions`
keeps a connection's sessions for its life. The loop that lists tools, lets the model call them
and feeds the results back inside a response is the core's (`tether.core.mcp`). Needs the `mcp`
extra (`pip install 'tether[mcp]'`), imported only when a create names an MCP server.
"""
