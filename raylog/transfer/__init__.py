"""The data channel: the framed wire protocol, the socket server (fetch replies sent with os.sendfile) and the client connection."""
