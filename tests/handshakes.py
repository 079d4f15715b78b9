"""TCP + TLS handshakes as a packet capture on ``lo`` saw them: the kernel's stamps as truth.

A busy host can delay when our process reads or writes, never when the kernel stamped a packet.
Each connection to ``server_port`` in a capture is cut into the instants a handshake test needs,
on the ``perf_counter_ns`` clock waterfalls use (through the process's clock anchor):

* ``syn_ns``: the client's SYN; ``synack_ns``: the server's SYN-ACK;
* ``hello_ns``: the first bytes the client sent (its ClientHello);
* ``flight_end_ns``: the last bytes the server sent before the client spoke again (in TLS 1.3,
  the flight from ServerHello to Finished: what completes the client's handshake);
* ``second_ns``: the client's next bytes (its Finished, and what it sends right behind it);
* ``server_bytes``: ``(stamp, payload length)`` of everything the server sent after that;
* ``client_bytes``: the same for the client, from ``second_ns`` on;
* ``client_packets``: the stamp of every packet the client sent, bare ACKs included (what
  :meth:`Handshake.reaction_ns` looks in).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from latency_analyzer.testing.tcpdump import Packet
from latency_analyzer.timeline import process_anchor


@dataclass
class Handshake:
    client_port: int
    syn_ns: int
    synack_ns: int | None = None
    hello_ns: int | None = None
    flight_end_ns: int | None = None
    second_ns: int | None = None
    server_bytes: list[tuple[int, int]] = field(default_factory=list)
    client_bytes: list[tuple[int, int]] = field(default_factory=list)
    client_packets: list[int] = field(default_factory=list)

    def reaction_ns(self) -> int | None:
        """The client's first packet after the server's flight ended: its ACK, sent by the
        kernel as it delivered the flight (a new connection acknowledges at once), or the
        Finished that carried the ACK. None: the capture holds no such packet."""
        end = self.flight_end_ns
        after = [t for t in self.client_packets if end is not None and t > end]
        return min(after) if after else None


def handshakes(packets: list[Packet], server_port: int) -> list[Handshake]:
    """Every connection to ``server_port`` whose SYN was captured, in the order of the SYNs."""
    anchor = process_anchor()
    out: dict[int, Handshake] = {}
    for p in packets:
        t = anchor.to_perf_ns(p.epoch_ns)
        if p.dport == server_port and p.flags == "S":
            out[p.sport] = Handshake(p.sport, t)
            continue
        from_client = p.dport == server_port
        hs = out.get(p.sport if from_client else p.dport)
        if hs is None:
            continue
        if not from_client and p.flags == "SA" and hs.synack_ns is None:
            hs.synack_ns = t  # the first: a retransmitted one answers the same SYN
        if from_client:
            hs.client_packets.append(t)
        if not p.payload:
            continue
        if from_client:
            if hs.hello_ns is None:
                hs.hello_ns = t
            elif hs.flight_end_ns is not None:
                if hs.second_ns is None:
                    hs.second_ns = t
                hs.client_bytes.append((t, len(p.payload)))
        elif hs.hello_ns is not None and hs.second_ns is None:
            hs.flight_end_ns = t
        elif hs.second_ns is not None:
            hs.server_bytes.append((t, len(p.payload)))
    return sorted(out.values(), key=lambda h: h.syn_ns)


def during(found: list[Handshake], start_ns: int, end_ns: int) -> Handshake:
    """The one connection whose SYN left between ``start_ns`` and ``end_ns``."""
    inside = [h for h in found if start_ns <= h.syn_ns <= end_ns]
    assert len(inside) == 1, (start_ns, end_ns, [h.syn_ns for h in found])
    return inside[0]
