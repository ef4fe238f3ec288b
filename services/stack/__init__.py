"""The local stack: runs the services as local processes for ``make train`` (no Docker, no GPU).

Not a container of its own: it only launches the others by their command lines and watches them.
"""
