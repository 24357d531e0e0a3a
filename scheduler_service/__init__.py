"""The scheduler service: owns the KV-cache byte budget, admits, places, relays."""
