"""`sluice serve`: the aiohttp app, its connections and admission, the JSON-RPC dialects, the fan-out, the relay of live blocks, the status page and the Dialogue feed."""
