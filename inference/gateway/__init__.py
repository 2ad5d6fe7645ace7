"""The OpenAI-compatible gateway: `/v1/models`, `/v1/completions`, `/v1/chat/completions`.

Clients authenticate with a team API token (`Authorization: Bearer fy_...`) and name a deployment
of that team as `model`; the gateway validates the request (`openai_schema`, pure), resolves the
deployment and calls its service through the compute backend (`services`), and answers with JSON or
server-sent events (`views`). Every request that reaches a deployment leaves one InferenceRequest row.
"""
