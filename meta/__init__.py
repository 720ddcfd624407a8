"""Placeholder: built in a later issue (see README Status)."""
