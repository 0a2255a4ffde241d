#!/usr/bin/env python3
"""Prints a TCP port of 127.0.0.1 that is free now and lies below the kernel's ephemeral range.

Why not bind port 0: that hands out an ephemeral port, the range every outgoing connection and
Open MPI's own listeners draw from. Between this probe and braid serve's bind, a rank of the very
job being launched can take it: serve then fails with "Address already in use" and the health
probes land on MPI's socket. A port under the ephemeral range is taken only by someone who asks
for it by number. Falls back to an ephemeral port where the range leaves no room below it.
Importable (free_port()) or run as a script.
"""
import random
import socket

LOWEST = 20000


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return s.getsockname()[1]
    except OSError:
        return 0
    finally:
        s.close()


def free_port():
    below = range(LOWEST, ephemeral_low())
    for port in random.sample(below, min(len(below), 200)):
        if bindable(port):
            return port
    return bindable(0)


if __name__ == "__main__":
    print(free_port())
