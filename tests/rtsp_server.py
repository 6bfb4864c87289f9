#!/usr/bin/python3
"""A real RTSP server for the camera tests (gst-rtsp-server through python3-gi).

    rtsp_server.py PORT NAME=CODEC:FILE [NAME=CODEC:FILE ...]

serves each MP4 FILE (CODEC: h264 or h265) at rtsp://127.0.0.1:PORT/NAME, paced at the file's
frame rate, from its first frame for every client (an unshared media per connection), over TCP
or UDP as the client asks. Prints READY once listening; runs until killed.

Debian: apt-get install python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-{base,good,bad}
"""

import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    Gst.init(None)
    port = sys.argv[1]
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(port)
    mounts = server.get_mount_points()
    for spec in sys.argv[2:]:
        name, rest = spec.split("=", 1)
        codec, path = rest.split(":", 1)
        if codec not in ("h264", "h265") or '"' in path:
            print(f"bad spec {spec!r}", file=sys.stderr)
            return 2
        n = codec[-1]
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(
            f'( filesrc location="{path}" ! qtdemux ! h26{n}parse config-interval=-1 '
            f"! rtph26{n}pay name=pay0 pt=96 config-interval=-1 )"
        )
        factory.set_shared(False)
        mounts.add_factory("/" + name, factory)
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{port}", file=sys.stderr)
        return 1
    print("READY", flush=True)
    GLib.MainLoop().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
