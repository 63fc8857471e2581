"""SB3's DQN with RL-Zoo's LunarLander-v2 entry (hyperparams/dqn.yml) on LunarLander-v3: the reference for
rlcli's dqn LunarLander row. Final test: 10 deterministic episodes, as rlcli's test phase."""
import sys, time
import gymnasium as gym
import numpy as np
from stable_baselines3 import DQN
from stable_baselines3.common.evaluation import evaluate_policy

seed = int(sys.argv[1])
env = gym.make("LunarLander-v3")
model = DQN("MlpPolicy", env, learning_rate=8.8e-4, batch_size=32, buffer_size=1_000_000, learning_starts=0,
            gamma=0.99, target_update_interval=10000, train_freq=16, gradient_steps=-1, exploration_fraction=0.2,
            exploration_final_eps=0.1, policy_kwargs=dict(net_arch=[256, 256]), seed=seed, device="cpu")
start = time.time()
model.learn(150_000)
returns, _ = evaluate_policy(model, gym.make("LunarLander-v3"), n_eval_episodes=10, deterministic=True,
                             return_episode_rewards=True)
print(f"seed {seed}: final test {np.mean(returns):.1f} (episodes {np.round(returns, 1).tolist()}), {time.time() - start:.0f} s")
