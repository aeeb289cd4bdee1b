"""The OpenAI JSON wire format: hand-written, table-driven translation to and from the protobufs."""
