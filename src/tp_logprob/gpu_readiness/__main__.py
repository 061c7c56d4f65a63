"""``python -m tp_logprob.gpu_readiness``: compile the launch matrix and check the gates."""

from tp_logprob.gpu_readiness.aot import main

raise SystemExit(main())
