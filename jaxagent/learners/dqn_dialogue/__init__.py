"""DQN for a task-oriented dialogue policy (Q-network over dialogue-act features)."""
