"""Tests of worker_service/engine/: the engine thread, its postprocess, speculation, sessions and step times."""
