"""SB3's A2C with RL-Zoo's LunarLander-v2 entry (hyperparams/a2c.yml) on LunarLander-v3, 8 envs."""
import sys, time
import gymnasium as gym
import numpy as np
from stable_baselines3 import A2C
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

seed = int(sys.argv[1])
env = make_vec_env("LunarLander-v3", n_envs=8, seed=seed)
model = A2C("MlpPolicy", env, gamma=0.995, n_steps=5, learning_rate=lambda p: 0.00083 * p, ent_coef=1e-5,
            seed=seed, device="cpu")
start = time.time()
model.learn(200_000)
returns, _ = evaluate_policy(model, gym.make("LunarLander-v3"), n_eval_episodes=10, deterministic=True,
                             return_episode_rewards=True)
print(f"seed {seed}: final test {np.mean(returns):.1f} (episodes {np.round(returns, 1).tolist()}), {time.time() - start:.0f} s")
