"""A package whose files import each other relatively."""

from .backbone import Backbone
from .heads import Head

__all__ = ["Backbone", "Head"]
