"""Developer tools run from the repository root with the .venv (`python -m devtools.<tool>`).

Not part of the installed package: they start the services from this checkout.
"""
