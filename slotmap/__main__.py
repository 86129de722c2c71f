"""``python -m slotmap doctor`` / ``python -m slotmap lab``."""

from slotmap.cli import main

raise SystemExit(main())
