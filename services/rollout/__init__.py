"""The rollout service: prompts → agent episodes → scored trajectory groups on the Redis stream."""
