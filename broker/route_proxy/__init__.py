"""The route proxy: `/routes/NAME/...`, an authenticated reverse proxy (HTTP and WebSocket) to
the apps behind routes, reached through tunnels the runners open to the server. Served on an
origin of its own (broker/route_proxy/origin.py), never the UI's and API's; mounted on the
server's app by broker/route_proxy/mount.py."""
