"""Root filesystems for sandboxes, built from recipes and cached by content hash."""

from .recipe import RECIPES, Recipe
from .store import ImageInfo, ImageStore

__all__ = ["RECIPES", "ImageInfo", "ImageStore", "Recipe"]
