"""Ray-side serving code: the LLM engine, its tiered prefix cache, the Serve application and routers.

Imports torch and ray (serve_app only), never Django; the control plane reaches it only through the
compute backend (controlplane/compute/ray_backend.py).
"""
