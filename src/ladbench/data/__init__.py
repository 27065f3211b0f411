"""Data stages: downloads, COCO-format annotations and the embedded synthetic scenes."""
