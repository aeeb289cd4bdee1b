"""The transport-free core: sessions (connection state), the turn pipeline, event building."""
