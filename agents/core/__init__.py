"""The agents' common machinery: the turn engine (``turns``), token trajectories, tokenizers, the policy and
frozen generators, clients of the retriever and searcher. The agents themselves (episode drivers with their
rewards) are the modules of ``agents``.
"""
