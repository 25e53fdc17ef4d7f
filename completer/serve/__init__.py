"""`completer serve`: the engine as a service. protocol (WebSocket frames), metrics (Prometheus),
openai (/v1 endpoints), app (HTTP routing, auth, the WebSocket handler, `run`)."""
