"""SB3's PPO with RL-Zoo's Hopper-v3 / HalfCheetah-v3 entries (hyperparams/ppo.yml) on the v5 env, at a given
budget; VecNormalize as RL-Zoo's `normalize: true` (with the entry's gamma, as RL-Zoo sets it), frozen for the 10 deterministic test episodes."""
import sys, time
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize

ENTRIES = {
    "Hopper-v5": dict(batch_size=32, n_steps=512, gamma=0.999, learning_rate=9.80828e-05, ent_coef=0.00229519,
                      clip_range=0.2, n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671),
    "HalfCheetah-v5": dict(batch_size=64, n_steps=512, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762,
                           clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096),
}
env_id, seed, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
env = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed), gamma=ENTRIES[env_id]["gamma"])
model = PPO("MlpPolicy", env, seed=seed, device="cpu", **ENTRIES[env_id],
            policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                               net_arch=dict(pi=[256, 256], vf=[256, 256])))
start = time.time()
model.learn(steps)
seconds = time.time() - start
test = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed + 1000), training=False, norm_reward=False)
test.obs_rms = env.obs_rms
returns, _ = evaluate_policy(model, test, n_eval_episodes=10, deterministic=True, return_episode_rewards=True)
print(f"{env_id} seed {seed}: final test {np.mean(returns):.1f} (episodes {np.round(returns, 1).tolist()}), "
      f"{seconds:.0f} s")
