"""Integrations with other libraries; each module registers flashattn when it is imported."""
