"""Root-cause diagnosis: findings with evidence, likely cause and remedy, ranked by time.

::

    from latency_analyzer.analysis.diagnose import diagnose, format_findings, what_if

    for finding in diagnose(wf):             # one request
        print(finding)
    diagnose(waterfalls)                     # many: a list of waterfalls or a WaterfallSet
    diagnose(wf, server_alpn="h2")           # lets the HTTP/1.1-vs-h2 rule speak
    what_if(wf, diagnose(wf))                # the TTFT with every client-side remedy

``server_alpn`` is what the server selects when offered h2; ``probe_alpn(url)`` in
``latency_analyzer.capture.alpn`` asks it (diagnosis itself reads waterfalls and opens no
socket).

Each rule looks at the requests' exclusive stage times (their attribution), connection and
TLS facts, and token gaps. Findings are judged against the metric that matters: TTFT when the
requests stream tokens, e2e otherwise. A finding's ``time_at_stake_s`` is the mean time of that
metric per request that the named cause costs today (an upper bound on what the remedy saves),
``what_if_s`` the metric with the remedy applied to the requests' own stages; findings are
sorted by time at stake. Every threshold is a field of ``Thresholds``. Statistics use
successful, non-warm-up requests only. A ``WaterfallSet`` keeps columns, not waterfalls, so
the rules that need TLS resumption, ALPN, per-origin grouping or token gaps speak only when
given waterfalls.

The modules: ``_facts`` (the request model the rules read, from a waterfall or a set's
columns, and TCP_INFO), ``_rules_setup`` (client and connection setup), ``_rules_server``
(server and token stream), ``_rules_network`` (the path, TCP_INFO), ``_findings`` (what a
finding says, thresholds), ``_engine`` (running, restating, ranking, what-if).
"""

from ._engine import RULES, diagnose, what_if
from ._findings import CLIENT_REMEDIES, Finding, Thresholds, WhatIf, format_findings

__all__ = [
    "CLIENT_REMEDIES",
    "RULES",
    "Finding",
    "Thresholds",
    "WhatIf",
    "diagnose",
    "format_findings",
    "what_if",
]
