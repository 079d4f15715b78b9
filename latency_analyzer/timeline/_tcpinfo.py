"""What the kernel knew about a request's TCP connection (Linux ``TCP_INFO``), as plain data."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TcpInfo"]


@dataclass(frozen=True, slots=True)
class TcpInfo:
    """One reading of a connection's ``struct tcp_info``.

    The kernel measures these from the segments themselves, so they tell the path apart from
    the server: ``rtt_us`` is what one round trip costs on this connection, whatever the
    server does with the request. Counters are totals over the connection's life so far.

    Attributes:
        at_ns: when it was read (``perf_counter_ns``): an instant of our event loop, after
            it had read the bytes the reading follows (a request's last one, for ``tcp_end``);
            how long after their arrival tells the loop's lateness, not the connection's.
        rtt_us: smoothed round-trip time (srtt), microseconds.
        rttvar_us: its mean deviation, microseconds.
        min_rtt_us: the smallest RTT seen (None: the kernel does not report it).
        rto_us: the retransmission timeout now, microseconds.
        retransmits: consecutive retransmissions of the oldest unacknowledged segment now.
        total_retrans: segments retransmitted over the connection's life.
        lost: segments the kernel considers lost now (not yet retransmitted or acked).
        reordering: how far out of order the kernel has seen segments (packets).
        snd_cwnd: the congestion window, in segments.
        delivery_rate: the last measured delivery rate, bytes/s (None: not reported).
        bytes_retrans: bytes retransmitted (None: not reported).
        segs_out: segments sent (None: not reported).
        rcv_ooopack: segments received out of order, the trace of the peer's losses or of
            reordering (None: not reported; Linux 5.4 on).
    """

    at_ns: int
    rtt_us: int
    rttvar_us: int
    min_rtt_us: int | None
    rto_us: int
    retransmits: int
    total_retrans: int
    lost: int
    reordering: int
    snd_cwnd: int
    delivery_rate: int | None = None
    bytes_retrans: int | None = None
    segs_out: int | None = None
    rcv_ooopack: int | None = None

    @property
    def rtt(self) -> float:
        """Smoothed RTT in seconds."""
        return self.rtt_us / 1e6
