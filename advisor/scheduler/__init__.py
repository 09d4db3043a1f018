"""The scheduler model (pure): SGLang's admission, reservation and retraction for one DP worker, replaying a
traffic picture at a given pool split; the recommender asks it "what would this traffic do at r?"."""
