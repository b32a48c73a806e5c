"""The old name of :mod:`moespec.model_shapes` (the README's library section named it until issue
18): importing it gives that module, with a ``DeprecationWarning``. New code imports
``moespec.model_shapes``."""

import sys
import warnings

from moespec import model_shapes

warnings.warn("moespec.models is now moespec.model_shapes (the published and configured MoE shapes); "
              "the old name is an alias", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = model_shapes
