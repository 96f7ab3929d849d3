"""Where Redis is and how to reach it: URLs, the client factory, Sentinel and Cluster, the layout check, durability.

Every part builds its Redis clients here and nowhere else; nothing here knows a part.
"""
