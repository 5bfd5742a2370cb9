import sys

from vllm_overlay.launcher import main

sys.exit(main())
