"""Tools: :func:`~hierplan.tools.base.tool` makes one of a function, a toolbox holds a run's,
:mod:`~hierplan.tools.schema` checks arguments against a JSON schema, and
:mod:`~hierplan.tools.mcp` brings the tools of MCP servers."""
