"""The compute backend: the only control-plane code that talks to Ray (DESIGN.md, layer 4)."""
