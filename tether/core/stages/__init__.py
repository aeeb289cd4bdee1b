"""The turn pipeline's stages, one module each. Every stage keeps per-conversation state on the
chain node (see `tether.core.chain`) so a cached continuation processes only the new items."""
