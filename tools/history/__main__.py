"""``python -m tools.history``: one release's run, or the historical report."""

from tools.history.runner import main

raise SystemExit(main())
