"""``python -m latency_analyzer.cli``: the console script."""

from . import main

raise SystemExit(main())
