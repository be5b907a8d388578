pub mod netns;
pub mod traffic;
