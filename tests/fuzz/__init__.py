"""Fuzz harnesses and hand-made hostile inputs (hostile.py)."""
