"""Everything central: fleet state, dashboard, top, events reader, cordoner, NATS permission layout."""
