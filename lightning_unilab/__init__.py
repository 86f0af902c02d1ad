"""MuJoCoUni + UniLab for Lightning: robot RL with MuJoCo on CPU threads."""
