"""``python -m tools.gpu_readiness``: compile the launch matrix and check the gates."""

from tools.gpu_readiness.aot import main

raise SystemExit(main())
