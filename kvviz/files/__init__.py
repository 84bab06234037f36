"""Every kind of file kvviz keeps: declared schemas, validating readers and atomic writers (stdlib + numpy only)."""
