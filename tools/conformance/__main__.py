"""``python -m tools.conformance``: run the suite against every peer; write the report."""

from tools.conformance.runner import main

raise SystemExit(main())
