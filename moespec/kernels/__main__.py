"""``python -m moespec.kernels [cpp|cuda]``: build the extension up front (CI does, before the tests)."""

from moespec.kernels.build import main

raise SystemExit(main())
