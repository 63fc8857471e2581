"""SB3's SAC (or TD3) with RL-Zoo's MuJoCo entries (hyperparams/sac.yml: SB3's defaults with learning_starts 10000;
td3.yml HalfCheetah: [400, 300], gaussian noise 0.1, train_freq = gradient_steps = 1000, batch 100, lr 1e-3) on a v5
env at a given budget; 10 deterministic test episodes at the end."""
import sys, time
import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.noise import NormalActionNoise

algo, env_id, seed, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
env = gym.make(env_id)
if algo == "sac":
    model = SAC("MlpPolicy", env, learning_starts=10_000, seed=seed, device="cpu")
else:
    n = env.action_space.shape[0]
    model = TD3("MlpPolicy", env, learning_starts=10_000, batch_size=100, learning_rate=1e-3, train_freq=1000,
                gradient_steps=1000, action_noise=NormalActionNoise(np.zeros(n), 0.1 * np.ones(n)),
                policy_kwargs=dict(net_arch=[400, 300]), seed=seed, device="cpu")
start = time.time()
model.learn(steps)
seconds = time.time() - start
returns, _ = evaluate_policy(model, gym.make(env_id), n_eval_episodes=10, deterministic=True,
                             return_episode_rewards=True)
print(f"{algo} {env_id} seed {seed}: final test {np.mean(returns):.1f} (episodes {np.round(returns, 1).tolist()}), "
      f"{seconds:.0f} s")
