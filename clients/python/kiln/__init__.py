"""kiln Python client helpers.

Importing this package does not import torch; ``kiln.export`` does.
"""

__all__ = ["export", "testrng"]
