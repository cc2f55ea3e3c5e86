//! Chat prompt formatting.
//!
//! The official BitNet b1.58 2B4T GGUF carries a placeholder template (`Human: …BITNETAssistant:`);
//! the model was trained with `Role: content<|eot_id|>` turns and an `Assistant: ` generation
//! prompt, so that is what hesper-rs uses for BitNet files.

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A system prompt.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
}

impl Role {
    fn label(self) -> &'static str {
        match self {
            Self::System => "System",
            Self::User => "User",
            Self::Assistant => "Assistant",
        }
    }
}

/// Formats one turn, `"{Role}: {content}<|eot_id|>"`.
pub fn format_turn(role: Role, content: &str) -> String {
    format!("{}: {content}<|eot_id|>", role.label())
}

/// The prompt the model answers after: every message, then `"Assistant: "`. BOS is added by
/// the tokenizer, not here.
pub fn format_prompt(messages: &[(Role, String)]) -> String {
    let mut out: String = messages.iter().map(|(r, c)| format_turn(*r, c)).collect();
    out.push_str("Assistant: ");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_trained_template() {
        let p = format_prompt(&[(
            Role::User,
            "Hey, are you conscious? Can you talk to me?".into(),
        )]);
        assert_eq!(
            p,
            "User: Hey, are you conscious? Can you talk to me?<|eot_id|>Assistant: "
        );
        let p = format_prompt(&[
            (Role::System, "Be brief.".into()),
            (Role::User, "Hi".into()),
            (Role::Assistant, "Hello!".into()),
            (Role::User, "Bye".into()),
        ]);
        assert_eq!(p, "System: Be brief.<|eot_id|>User: Hi<|eot_id|>Assistant: Hello!<|eot_id|>User: Bye<|eot_id|>Assistant: ");
    }
}
