import sys

from vllm_overlay.cli import main

sys.exit(main())
