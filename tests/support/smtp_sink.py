"""A real SMTP server for tests (aiosmtpd): stores every message it accepts
as DIR/<n>.eml and prints "READY <port>" once it listens.

usage: smtp_sink.py DIR PORT   (PORT 0 picks a free port)
"""
import os
import socket
import sys
import time

from aiosmtpd.controller import Controller


class Store:
    def __init__(self, directory):
        self.directory = directory
        self.count = 0

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        path = os.path.join(self.directory, f"{time.time_ns()}-{self.count}.eml")
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(envelope.original_content or envelope.content)
        os.rename(tmp, path)
        return "250 OK"


def main():
    directory, port = sys.argv[1], int(sys.argv[2])
    os.makedirs(directory, exist_ok=True)
    if port == 0:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
    controller = Controller(Store(directory), hostname="127.0.0.1", port=port)
    controller.start()
    print(f"READY {port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
